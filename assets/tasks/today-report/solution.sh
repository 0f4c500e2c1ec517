touch "reports/$(date +%F).txt"
