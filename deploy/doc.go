// Package deploy holds the tests of the repository's deployment files:
// docker-compose.yml, .env, the Dockerfiles and the Grafana provisioning
// they mount. There is no Go code to deploy here; the tests load the
// files the way Docker Compose does and check them against the
// repository.
package deploy
