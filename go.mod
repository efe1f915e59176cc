module pagoda

go 1.26.8
