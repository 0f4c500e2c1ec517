rm -f *.tmp
