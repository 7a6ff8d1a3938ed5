"""Accounts and tokens: the token collector (`mailroom collect`) and where its batches go."""
