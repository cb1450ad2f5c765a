"""Renderers read only Timelines: terminal (rich), matplotlib, traces."""
