"""The live dashboard page in a real browser: Debian's headless Chromium driven by Selenium
(`chromium`), and the script that takes the dashboard's screenshots (README, docs/observability.md) from a live cluster
(`dashboard_screenshot`)."""
