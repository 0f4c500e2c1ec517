ls inbox > listing.txt
