"""Device profiles shipped with mimo (JSON files written by `mimo plan --calibrate`)."""
