id=$(sbx create)
sbx exec "$id" 'x = 41'
sbx exec "$id" 'print(x + 1)'
kids=$(sbx fork "$id" -n 2)
sbx rm "$id" $kids
