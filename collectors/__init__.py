"""inferpath.collectors"""
