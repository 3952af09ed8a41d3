"""The app's template tag libraries."""
