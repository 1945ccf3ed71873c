"""Small widgets shared by the pages."""

from __future__ import annotations

import pandas as pd
import streamlit as st


def csv_download(df: pd.DataFrame, name: str, key: str) -> None:
    st.download_button(f"Download {name} as CSV", df.to_csv(index=False).encode(), file_name=f"{name}.csv",
                       mime="text/csv", key=key, on_click="ignore")


def pct_columns(df: pd.DataFrame) -> dict:
    """Signed percentage formatting for the Δ% columns (the CSV keeps plain numbers)."""
    return {c: st.column_config.NumberColumn(c, format="%+.1f%%") for c in df.columns if c.endswith("Δ%")}
