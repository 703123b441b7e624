"""The what-if simulator: replay a job trace against a grid trace under each policy."""
