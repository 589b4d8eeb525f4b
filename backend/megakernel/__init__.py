"""The decode megakernel's host side: ABI mirror, schedule builder, CPU emulator, native loader and
the `megakernel` decode backend (DESIGN §6). Only `native.py` imports the compiled extension."""
