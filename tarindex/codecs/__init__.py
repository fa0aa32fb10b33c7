"""Decode and encode member bytes by extension: one extension table, images, select."""
