mkdir data
for spec in sales-q1.csv:95 sales-q2.csv:45 inventory.csv:31 notes.txt:29 orders.csv:5 today.csv:0; do
  name=${spec%%:*}; age=${spec##*:}
  echo "$name" > "data/$name"
  touch -d "@$(( $(date +%s) - age * 86400 - 3600 ))" "data/$name"
done
