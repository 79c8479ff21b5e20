"""What shows the metrics snapshot: the Prometheus exporter and ``vgpuvirt top``'s view (above services)."""
