"""inferpath.storage"""
