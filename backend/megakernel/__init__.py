"""The decode megakernel's host side: ABI mirror, schedule builder, CPU emulator, native loader and
the `megakernel` decode backend (docs/MEGAKERNEL.md). Only `native.py` imports the compiled extension."""
