for i in $(seq 0 13); do
  f="/work/logs/app-$(date -d "-$i days" +%F).log"
  if [ "$i" -le 7 ] && [ ! -f "$f" ]; then echo "deleted $f, which is $i days old"; exit 1; fi
  if [ "$i" -gt 7 ] && [ -e "$f" ]; then echo "kept $f, which is $i days old"; exit 1; fi
done
echo "ok: logs newer than 8 days kept, older deleted"
