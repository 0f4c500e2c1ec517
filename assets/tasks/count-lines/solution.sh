wc -l < data.csv > count.txt
