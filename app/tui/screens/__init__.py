"""Screens: loading (start), chat (main), and the approval and session-picker modals."""
