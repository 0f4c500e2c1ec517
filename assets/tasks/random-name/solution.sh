mv incoming/upload-* incoming/upload.dat
