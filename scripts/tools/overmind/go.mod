// Tools module: builds the pinned Overmind (its `go install` is refused
// because of replace directives). `make check` runs:
//   cd scripts/tools/overmind && go build -o ../../../bin/overmind github.com/DarthSim/overmind/v2
module github.com/nstance-dev/nstance/scripts/tools/overmind

go 1.26

require github.com/DarthSim/overmind/v2 v2.5.1

require (
	github.com/Envek/godotenv v0.0.0-20240326021258-e36c8a003587 // indirect
	github.com/cpuguy83/go-md2man/v2 v2.0.2 // indirect
	github.com/kardianos/osext v0.0.0-20190222173326-2bc1f35cddc0 // indirect
	github.com/matoous/go-nanoid v1.5.0 // indirect
	github.com/russross/blackfriday/v2 v2.1.0 // indirect
	github.com/sevlyar/go-daemon v0.1.6 // indirect
	github.com/urfave/cli v1.22.12 // indirect
	golang.org/x/sys v0.4.0 // indirect
	golang.org/x/term v0.4.0 // indirect
)
