"""Offloaded data loading against local loaders (images, video, audio, S3), and the pinned batch pool."""
