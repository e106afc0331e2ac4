"""(being written: registered by this session)"""
