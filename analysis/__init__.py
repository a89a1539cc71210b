"""inferpath.analysis"""
