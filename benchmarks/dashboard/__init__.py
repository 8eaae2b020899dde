"""The dashboard in a real browser: Debian's headless Chromium driven by Selenium (`browser`),
and the script that takes the README's screenshot from a live cluster (`screenshot`)."""
