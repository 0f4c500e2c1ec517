mkdir logs
for i in $(seq 0 13); do
  d=$(date -d "-$i days" +%F)
  echo "$d 10:00:00 INFO service started" > "logs/app-$d.log"
done
