"""inferpath.demo"""
