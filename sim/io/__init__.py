"""The ground floor: errors shown to the user, the bounds of what the simulator represents, reading tables,
TOML text, safe output files and progress bars. Imports nothing else of `sim`."""
