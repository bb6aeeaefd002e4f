"""Teaching helpers: small models and data, devices, and recording observed symptoms."""
