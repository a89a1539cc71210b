"""inferpath.server"""
