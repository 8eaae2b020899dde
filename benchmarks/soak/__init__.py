"""`bench.py soak`: a mixed workload under periodic kills and freezes (chaos): completed, failed,
lost and leaked blocks."""
