mkdir -p archive
find data -type f -mtime +30 -exec mv {} archive/ \;
