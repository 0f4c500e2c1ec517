mkdir backups
