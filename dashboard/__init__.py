"""The Streamlit dashboard (read-only on the store)."""
