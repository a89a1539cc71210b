"""inferpath.alerts"""
