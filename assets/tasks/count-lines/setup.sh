{ echo "id,name,amount"; for i in $(seq 1 136); do echo "$i,item-$i,$((i * 7 % 100))"; done; } > data.csv
