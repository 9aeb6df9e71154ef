"""Child processes, their reaping, the subprocess runner and sd_notify."""
