"""inferpath.dashboard"""
