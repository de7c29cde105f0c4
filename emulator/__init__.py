"""A local emulator of the Cloud TPU API (google.cloud.tpu.v2) with real SSH hosts."""
