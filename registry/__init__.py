"""The catalog: every registered name, one module per kind (installed as `framework.catalog`)."""
