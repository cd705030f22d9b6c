"""Generated gRPC stubs for proto/dsched.proto (run `make proto`; never edit)."""
