"""The shared places rayflow writes to, kept safe: Ray's token private and the one rule for auth
off (auth), secrets masked in every channel (redaction), and the one signed line a submitted job
sends its result back on, read as data, never as code (result_channel)."""
