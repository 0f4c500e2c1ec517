echo "The quarterly report, version 3." > draft.txt
