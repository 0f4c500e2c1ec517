cd /work
for f in sales-q1.csv sales-q2.csv inventory.csv; do
  [ -f "archive/$f" ] || { echo "archive/$f missing: it is older than 30 days"; exit 1; }
  [ ! -e "data/$f" ] || { echo "data/$f still there"; exit 1; }
done
for f in notes.txt orders.csv today.csv; do
  [ -f "data/$f" ] || { echo "data/$f moved or deleted, but it is newer than 30 days"; exit 1; }
done
echo "ok"
