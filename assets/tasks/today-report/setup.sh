mkdir reports
for d in 3 2 1; do echo "daily report" > "reports/$(date -d "-$d days" +%F).txt"; done
