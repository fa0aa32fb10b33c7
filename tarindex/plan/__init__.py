"""Pure seeded planning of streaming epochs, mixing schedules and resumes (no torch)."""
