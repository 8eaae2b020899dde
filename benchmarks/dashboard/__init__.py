"""`bench.py dashboard`: the Grafana dashboard's panels over a live cluster scraped by a real Prometheus."""
