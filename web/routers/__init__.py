"""The dashboard's routes, one module per audience: pages (people), api (scripts), badges (READMEs), upload (CI)."""
