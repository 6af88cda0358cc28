"""Infrastructure shared by the single-file scripts in cleanrl/ (never algorithm code)."""
