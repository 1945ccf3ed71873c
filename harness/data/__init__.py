"""Shipped reference tables as data (GPU-hour prices, hardware peaks), each figure with its source and date."""
