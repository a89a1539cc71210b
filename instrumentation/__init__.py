"""inferpath.instrumentation"""
