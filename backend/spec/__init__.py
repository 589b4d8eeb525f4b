"""Speculative decoding: prompt-lookup drafts (`drafter`) verified as rows of one decode step
(`acceptance`)."""
