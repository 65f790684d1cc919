"""Generated stubs of proto/verifyd/v1/verifyd.proto (build_stubs.sh or `pip install` writes them)."""
