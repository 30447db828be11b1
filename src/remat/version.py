"""remat's version: stamped on saved plans and part of the plan cache's code fingerprint."""

__version__ = "0.1.0"
