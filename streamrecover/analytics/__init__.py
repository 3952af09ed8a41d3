"""Recovery analytics: figure definitions, windows, the SQL, the report, the rollup and the page (docs/analytics.md)."""
