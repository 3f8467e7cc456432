"""Everything a person reads: the HTML report of a scenario's runs and sweep (altair charts, rendered
offline; `build.build_report`), the plan and fidelity pages and files, and the terminal tables."""
